"""The cluster manifest (cluster.yaml): strict models, cross-field rules, loading with line numbers."""
