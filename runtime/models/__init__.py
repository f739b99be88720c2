"""Model implementations (the Llama family) and their building blocks."""
