"""Front ends: recognize which tuned op a user's PyTorch function computes (see ``recognize``)."""
