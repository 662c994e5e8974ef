"""``python -m petastorm_balanced`` runs the ``petastorm-balanced`` command line."""
import sys

from .cli import main

sys.exit(main())
