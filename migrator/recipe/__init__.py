"""The recipe: its models, YAML loading, the wording of its problems, the one-off recipes of `convert`."""
