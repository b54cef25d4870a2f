"""Multi-turn episodes: environments, tools, tool-call parsers and the token-in/token-out runner."""
