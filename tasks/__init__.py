"""Task sets, harness adapters and collection (coming with the collect issue)."""
