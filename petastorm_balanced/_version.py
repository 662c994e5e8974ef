"""The package version, in a module of its own so that submodules never import the package's ``__init__``."""
__version__ = "0.2.0"
