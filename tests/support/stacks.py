"""What the stack under test has, for skip markers: Petastorm imports only on the petastorm stack (pyarrow < 15)."""
import pyarrow as pa
import pytest

from petastorm_balanced.reading.backends import petastorm_importable

HAVE_PETASTORM = petastorm_importable()
petastorm_only = pytest.mark.skipif(not HAVE_PETASTORM, reason="needs Petastorm, which does not import on this "
                                                               "stack (pyarrow >= 16)")
PYARROW_MAJOR = int(pa.__version__.split(".")[0])
