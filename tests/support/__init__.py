"""Code the tests share; test modules import it, never each other."""
