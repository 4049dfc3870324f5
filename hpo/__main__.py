from hpo.cli import entry

entry()
