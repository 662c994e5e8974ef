"""N sources with weights (one plan is read by the same stages below): settings, position, rows, elastic."""
