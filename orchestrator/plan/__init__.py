"""Sizing: GPU/model catalog, the seed's memory formulas, vLLM's capacity math, cluster shape, the planner."""
