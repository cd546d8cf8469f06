//! Harnesses for the fuzz targets and property tests (written next).
