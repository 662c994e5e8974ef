"""Row groups into columns: the columns read, fragments read and decoded, a transform applied there."""
