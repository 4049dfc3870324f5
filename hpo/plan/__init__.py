"""Planning (`hpo plan`, `hpo table`): what an experiment will cost and how likely it ends with an answer, before it
spends anything. `forecast` runs the file many times on the simulated runner in throw-away databases and summarizes
the outcomes; `proxy` moves a real file the table cannot serve as it is onto the table, stating its assumptions;
`truth` is what the outcomes are judged against; `chances` draws the verdict's chances from a stated spread or a
pilot's; `advice` plans the file again at other trial budgets (`--power` alone); and `pilot_table` turns a pilot
experiment's curves into a curve table. It adds no path of its own through the study loop: it drives the engine like
`hpo run` does, and may import everything below it.
"""
