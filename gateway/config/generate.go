package config

// docs/configuration.md is generated from this package's structs.
//go:generate go run ./gendoc -root ../..
