"""What the server does: aggregate the uploads (FedAvg, uniform, similarity)."""
