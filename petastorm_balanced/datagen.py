"""``python -m petastorm_balanced.datagen`` (the documented path); the generator lives in ``tools/datagen.py``."""
from .tools.datagen import DatasetInfo, main, make_petastorm_dataset, make_plain_dataset, make_unischema  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
