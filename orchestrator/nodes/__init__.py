"""What a node is: probed facts (values), probe argv builders + pure parsers, probe scripts, inventory (gather over SSH)."""
