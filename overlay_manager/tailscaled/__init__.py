"""tailscaled."""
