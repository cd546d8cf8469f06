//! Pairwise channels (placeholder).
