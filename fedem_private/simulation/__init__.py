"""The round loop that composes backbone, merge, codec, privacy and aggregator; its reference."""
