"""The round loop that composes backbone, merge, codec, privacy and aggregator.

Its one-client-at-a-time reference is :mod:`fedem_private.reference.round`.
"""
