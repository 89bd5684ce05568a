# jagielski rules (placeholder)
