"""What the columns are: the stored schema, list shapes (scanned or declared), the batches' schema."""
