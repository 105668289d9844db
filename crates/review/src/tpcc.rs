//! TPC-C.
