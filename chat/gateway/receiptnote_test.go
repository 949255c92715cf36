package gateway

import "testing"

func TestParseReceiptNote(t *testing.T) {
	t.Parallel()
	got := parseReceiptNote("3:7:1796047141444000,bad,4:1:0")
	if len(got) != 2 || got[0].chatID != 3 || got[0].upto != 7 || got[0].at.UnixMicro() != 1796047141444000 || got[1].chatID != 4 {
		t.Fatalf("parseReceiptNote = %+v", got)
	}
}
