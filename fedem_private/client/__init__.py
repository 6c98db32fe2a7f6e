"""What a client does: merging its tables (SR/SM/DM/EM) and encoding its upload."""
