"""The product adapter over the generic loop: request building, dispatch, result mapping."""
