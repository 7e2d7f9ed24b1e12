package sluicestatus_test

import (
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluicestatus"
)

func ExampleNew() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	tr, err := sluice.New(nil, sluice.WithRate(600, time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	// A first call makes the lane; the page shows it from the next sample
	// on (New takes one).
	client := &http.Client{Transport: tr}
	resp, err := client.Get(api.URL)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()

	// The status page, mounted beside the service's other debug handlers.
	status, err := sluicestatus.New(tr)
	if err != nil {
		log.Fatal(err)
	}
	defer status.Close() // stops its sampler
	mux := http.NewServeMux()
	mux.Handle("/debug/sluice/", http.StripPrefix("/debug/sluice", status))
	ops := httptest.NewServer(mux)
	defer ops.Close()

	// A browser opens ops.URL + "/debug/sluice/"; a script can read the
	// page's figures as JSON.
	resp, err = http.Get(ops.URL + "/debug/sluice/?format=json")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var feed struct {
		Shown []struct {
			Ceiling float64 `json:"ceiling"`
			Levels  []struct {
				Name    string `json:"name"`
				Granted int    `json:"granted"`
			} `json:"levels"`
		} `json:"shown"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&feed); err != nil {
		log.Fatal(err)
	}
	lane := feed.Shown[0]
	fmt.Printf("ceiling %g/s, %s granted %d\n", lane.Ceiling, lane.Levels[1].Name, lane.Levels[1].Granted)
	// Output: ceiling 10/s, normal granted 1
}
