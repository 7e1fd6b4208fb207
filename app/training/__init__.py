"""Two-phase fine-tuning: one custom loop for one device and many workers alike."""
