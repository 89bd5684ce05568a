# hw3 rules (placeholder)
