"""fedem-private: simulate private federated recommendation and measure it honestly."""

__version__ = "0.1.0"
