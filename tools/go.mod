module github.com/sluice-go/sluice/tools

go 1.26.8
