"""Open or save a path, a model folder, an index, a glob or a URL: routing and sharding over the formats."""
