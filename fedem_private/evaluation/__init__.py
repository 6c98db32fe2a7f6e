"""Ranking metrics (HR@K, NDCG@K; sampled and full ranking) over each client's own model."""
