"""The public loaders (make_loader, BalancedIterableDataset, make_reader), each built from one request."""
