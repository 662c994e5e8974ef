"""``python -m petastorm_balanced`` runs the ``petastorm-balanced`` command line."""
from .tools.cli import run

run()
