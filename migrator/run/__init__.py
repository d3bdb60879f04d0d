"""Running plans: one recipe, many jobs, one output written in parallel, Ray."""
