//! Consumer scenarios written once for every broker.
