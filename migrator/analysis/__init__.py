"""Looking at checkpoints: inspect, stats, diff, and the HTML report."""
