"""One plan's rows for a slot: settings, layout, position and the stream of windows cut into batches."""
