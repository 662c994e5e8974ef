"""Planning engines: each turns a dataset and a predicate into a Catalog; balancing is shared."""
