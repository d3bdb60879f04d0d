"""What a plan does to a tensor: the ops graph, adapters and module types, template matching."""
