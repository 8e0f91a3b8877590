"""``python -m gradwire``: the command line, as the ``gradwire`` script runs it."""
import sys

from gradwire.cli.main import main

sys.exit(main())
