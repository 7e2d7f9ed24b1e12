module github.com/sluice-go/sluice

go 1.26.8

require (
	github.com/hashicorp/go-retryablehttp v0.7.8
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.25.0
	golang.org/x/time v0.16.0
)

require (
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
