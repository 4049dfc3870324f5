"""The `hpo` command: one module per command group, each with its parser and its printing (`run`, `plan`,
`inspection`, `export`, `report`, `serve`, `imports`), the shared options and the database opener in `common`,
and the parser and entry point in `main`. It is the top of the control plane: it may import every package of `hpo`,
and `serve` imports the server. Each command imports what it uses when it runs, so `hpo --help` starts fast.
"""

from hpo.cli.main import entry, main

__all__ = ["entry", "main"]
