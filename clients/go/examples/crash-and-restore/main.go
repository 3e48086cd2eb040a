// crash-and-restore unix:///path/to/checkpointd.sock my-thread
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"checkpointd.dev/clients/go/checkpointd"
)

func main() {
	ctx, address, threadID := context.Background(), os.Args[1], os.Args[2]
	// "" would read CHECKPOINTD_ADDRESS; the token comes from CHECKPOINTD_TOKEN.
	client, err := checkpointd.Dial(ctx, address)
	if err != nil {
		log.Fatal(err) // says why: no socket there, connection refused, TLS, token
	}
	defer client.Close()

	// A fresh sandbox (or one after a crash): bring back the newest checkpoint first.
	restored, err := checkpointd.RestoreSandboxCheckpoint(ctx, client, checkpointd.RestoreOptions{ThreadID: threadID})
	if err != nil {
		log.Fatal(err)
	}
	if restored == nil {
		fmt.Println("New thread")
	} else {
		fmt.Println("Restored", restored.Id)
	}

	// ... the agent works; save between its steps ...
	saved, err := checkpointd.CaptureSandboxCheckpoint(ctx, client, checkpointd.CaptureOptions{ThreadID: threadID, Label: "step done"})
	switch {
	case errors.As(err, &checkpointd.WriterConflictError{}):
		// Another capture of the thread is running: skip, the next one saves the same files.
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Printf("Saved %s (%d files)\n", saved.Id, saved.FileCount)
	}
}
