# tramer rules (placeholder)
