from hpo.cli.main import entry

entry()
