"""The engine: what drives an experiment on our own study loop. `study` is the loop (controller.ask -> runner.submit
-> storage -> controller.tell, and resume's replay), `local` puts it together for `hpo run` / `hpo resume` (checks
before any write, the claim, the heartbeat, the summary), `liveness` is the controller's heartbeat and how to read
it, and `progress` is what a user sees while it runs. It may import everything below it (vocabulary, storage,
experiment, controllers, runners, evidence); only the CLI, the planner and the NNI engine import it, and the server
`liveness` and `settle` (before a process takes an experiment over from its controller: whether that still runs here).
"""
