# accounting rules (placeholder)
