"""``python -m petastorm_balanced`` runs the ``petastorm-balanced`` command line."""
from .cli import run

run()
