"""What is checked before anything runs: the code extracted from a response, static rules on its
Python and C++, its load_inline calls, what the preprocessor sees."""
