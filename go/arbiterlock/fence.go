package arbiterlock

import (
	"errors"
	"fmt"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FenceAnnotation holds, on an object written under fencing, the highest term that wrote it.
const FenceAnnotation = "arbiter.dev/fencing-term"

// ErrStaleTerm: the object was written at a later term than the writer's; the writer's term is
// over and it must stop.
var ErrStaleTerm = errors.New("arbiterlock: a later term wrote this object")

// Fence checks that obj was not written at a term later than term, and records term on it.
// Call it between reading obj and writing it back with the resourceVersion read (an update, a
// compare-and-swap): a writer whose term is over then either finds the later term and gets
// ErrStaleTerm, or loses the compare-and-swap to the later writer and reads again. Every
// writer of the object must fence. (arbiterctrl.FencedUpdate does the whole read-fence-write.)
func Fence(obj metav1.Object, term int32) error {
	annotations := obj.GetAnnotations()
	if v, ok := annotations[FenceAnnotation]; ok {
		seen, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return fmt.Errorf("arbiterlock: %s on %s is %q, not a term", FenceAnnotation, obj.GetName(), v)
		}
		if int32(seen) > term {
			return fmt.Errorf("%w: %s was written at term %d, this writer's is %d", ErrStaleTerm, obj.GetName(), seen, term)
		}
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[FenceAnnotation] = strconv.FormatInt(int64(term), 10)
	obj.SetAnnotations(annotations)
	return nil
}
