module github.com/sluice-go/sluice/bench

go 1.26.8

replace github.com/sluice-go/sluice => ../

require (
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/sluice-go/sluice v0.0.0-00010101000000-000000000000
	golang.org/x/sync v0.25.0
	golang.org/x/time v0.16.0
)

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/influxdata/tdigest v0.0.1 // indirect
)
