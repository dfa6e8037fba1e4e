"""Task -> Candidate: prompts, templates, LLM clients, mutation, repair."""
