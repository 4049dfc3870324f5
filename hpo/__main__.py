import sys

from hpo.cli import main

sys.exit(main())
