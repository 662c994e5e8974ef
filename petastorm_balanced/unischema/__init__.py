"""Petastorm's Unischema and codecs without Petastorm: read and write Petastorm datasets on any stack.

``Unischema``, ``UnischemaField`` and the four codecs decode to Petastorm 0.12.1's values; ``dict_to_spark_row`` and
``materialize_dataset`` write datasets Petastorm 0.12.1 reads; ``pickling`` loads a stored schema through an
allow-list (``UnsafeDatasetError`` for anything else). Needs numpy and pyarrow; images need OpenCV or Pillow (the
``[images]`` extra); writing needs pyspark.
"""
from .codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from .schema import Unischema, UnischemaField, match_unischema_fields
from .write import dict_to_spark_row, materialize_dataset

__all__ = ["CompressedImageCodec", "CompressedNdarrayCodec", "NdarrayCodec", "ScalarCodec", "Unischema",
           "UnischemaField", "dict_to_spark_row", "match_unischema_fields", "materialize_dataset"]
